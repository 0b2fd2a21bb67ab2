"""``loader=torchvision``: an ImageFolder-style dataset + DataLoader worker processes."""
