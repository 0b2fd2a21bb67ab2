"""The data layer: from a config to file lists. Discovery, the dataset index on disk, the splits
in memory, the generated set, and where a resumed epoch continues."""
