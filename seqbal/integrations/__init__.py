"""Adapters that make a trainer use seqbal, one module per trainer (``seqbal.integrations.verl``).

Each adapter imports its trainer only when one of its functions is called, so importing seqbal
never requires a trainer to be installed.
"""
