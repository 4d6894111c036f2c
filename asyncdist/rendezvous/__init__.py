"""How ranks find each other: stores, ``init_method`` URLs, and the bootstrap."""
