"""What the scenarios set up and drive, most of it in processes of its own: the benches'
node on the simulator, the stream bench's server and client processes, the simulated
cluster (the fake API server, ``capwatch pool`` and ``capwatch controller`` processes),
the KWOK cluster on the real control plane, the HTTP load generator, a plain Node
watcher and the heap profiler a controller can run under.

Imports the floors and the shared part, capwatch, the tests' fakes and their real
control plane; never a scenario, nor the figures.
"""
