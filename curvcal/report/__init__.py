"""Presentation: tables, markdown, the JSON file and plots of every command's result.

Only :mod:`curvcal.commands` imports this package; the library computes, this package shows.
"""
