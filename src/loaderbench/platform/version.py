"""The project's version, as pyproject.toml gives it (what run_config.json and W&B record), and
the installed versions of the libraries a remembered decision depends on."""

from importlib import metadata

VERSION = "0.1.0"


def installed_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Each distribution's installed version (None: not installed), read from its metadata:
    nothing is imported, so a key made of them costs no import of torch or a codec."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
