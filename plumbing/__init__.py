"""The plumbing: file formats, downloads, the command lines' glue and the helpers.

The chapters at the top level import what they need from here; nothing here is a chapter.
plumbing/README.md lists each file.
"""
