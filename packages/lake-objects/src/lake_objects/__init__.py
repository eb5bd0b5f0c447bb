"""Lake's managed object stage: local and S3 uploads and verified reads.

The stage implementation arrives with FILE values; today this package holds
its public home so that the packages depending on it build and install.
"""

__all__: list[str] = []
