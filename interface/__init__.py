"""The command lines and what they print, and finding a model by its name: what stands on the chapters.

Each top-level command hands over to its command line here (through start.py) at its `__main__`
entry point, above its imports; nothing else imports these files. interface/README.md lists each file.
"""
