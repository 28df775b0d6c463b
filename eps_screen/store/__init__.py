"""Where results live: the content-addressed result store (a local directory or a URL), its files, the
runs' leases and claims, and what every artifact records about how it was made."""
