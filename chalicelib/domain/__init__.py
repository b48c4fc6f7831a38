"""The domain: pure Python, no AWS imports. Tested without moto."""
