"""Who is calling (``authn``: credentials to a ``Principal``, cached per process) and what
they may do (``permissions``: one rule per route, declared next to it)."""
