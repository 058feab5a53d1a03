"""The small things every capwatch package uses, and nothing else.

Clocks, the exception hierarchy, command-line options with environment twins,
the one backoff, the one node-name rule, addresses, throttled logging, the
readiness rule, the sequenced broadcast ring, TLS files checked as gRPC will
load them and scratch directories that do not outlive a killed process. The
bottom of the house: it imports only the standard library, never another
capwatch package.
"""
