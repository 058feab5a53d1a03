"""``capwatch watch``: a terminal UI over the client library.

``command`` runs it, ``settings`` are its flags, ``printer`` chooses what to
print, ``tables`` and ``cluster_table`` lay the rows out, ``screen`` draws them
(the only module that imports ``rich``'s live display). Imports the client, the
api and the kit; the demo reuses its tables.
"""
