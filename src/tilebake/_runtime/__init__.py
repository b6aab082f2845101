"""Runtime: the manifest-driven loader and the native launcher."""
