"""Parsers: one module per tool, turning the tool's text into typed records
and findings. Pure functions: text in, data out; no subprocess, no I/O."""
