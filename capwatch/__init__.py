"""capwatch's one import name, and its commands, above every other room.

Every room imports and installs as ``capwatch.<room>``: the folders stay at the
top of the repository and ``capwatch/<room>`` links to each (the wheel holds
them as real subpackages). The commands are this package's own modules, the
only ones that wire the rooms together: ``cli`` (the command line), ``launch``
(the node agent with its server and metrics), ``shim`` (the readiness probe),
``pool`` (many simulated nodes), ``watch`` (the terminal UI) and ``demo``.
Below them: ``controller`` (the cluster side), ``client`` (the subscriber
library), ``server`` (the agent's protocol edge), ``api`` (the wire contract),
``agent`` (the enforcement loop), ``kube`` (the Kubernetes API both sides
speak) and ``kit``; none of them imports the commands.

grpc core (C) logs on its own, to stderr. Since it moved to absl logging it
prints INFO lines when ``GRPC_VERBOSITY`` is unset, among them one per failed
TLS handshake: any client speaking plaintext, or presenting the wrong
certificate, to the TLS port wrote a line per connection (2,000 failed
handshakes, 2,002 lines). grpc reads the variable once, when it is first
imported, and every capwatch command is this package's before it imports
grpc: so here, unless the operator set it, it becomes ``ERROR``, the default
grpc documented before that move. A failed handshake is the client's to read
(its call fails with UNAVAILABLE naming the TLS error); ``GRPC_VERBOSITY=INFO``
shows them on the agent too, a line each.
"""

import os

if not os.environ.get("GRPC_VERBOSITY"):
    os.environ["GRPC_VERBOSITY"] = "ERROR"
