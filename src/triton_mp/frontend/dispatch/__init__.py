"""The path between the frontend and the scheduler: the inbox, pending requests, tickets, the
direct handoff and the event loop that polls the rings.
"""
