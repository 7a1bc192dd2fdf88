"""Built-in example jobs."""
