"""``capwatch watch``: a terminal UI over the client library.

``command`` runs it, ``settings`` are its flags, ``printer`` chooses what to
print, ``tables`` and ``cluster_table`` make the rows of an agent's and a
controller's stream, ``layout`` lays them out (on rich's tables) and
``screen`` draws them (rich's live display). Imports the client, the
api and the kit; the demo reuses its tables.
"""
