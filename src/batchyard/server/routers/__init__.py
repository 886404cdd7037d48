"""Thin routers: parse, authorise, call one service function in one transaction."""
