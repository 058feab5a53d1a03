"""The small things every capwatch package uses, and nothing else.

Clocks, the exception hierarchy, command-line options with environment twins,
the one backoff, the one node-name rule, addresses, throttled logging, the
readiness rule and the sequenced broadcast ring. The bottom of the house: it
imports only the standard library, never another capwatch package.
"""
