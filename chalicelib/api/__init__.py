"""HTTP-facing helpers: request parsing, validation, representations, problems."""
