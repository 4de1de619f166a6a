"""The plumbing: file formats, downloads and the helpers that the chapters stand on.

The chapters at the top level import what they need from here; nothing here imports a chapter
or a command line. plumbing/README.md lists each file.
"""
