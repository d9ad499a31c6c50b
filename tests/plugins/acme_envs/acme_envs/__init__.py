"""A third-party environment package: its ids come from its entry points, not from an import."""
