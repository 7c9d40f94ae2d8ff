"""Tooling for this repository's checkout (not installed with the package): `python -m tools.readme`."""
