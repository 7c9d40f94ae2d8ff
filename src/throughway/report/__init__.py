"""Reports: figures (matplotlib) and tables made from results files."""
