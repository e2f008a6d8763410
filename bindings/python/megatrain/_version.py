"""The package's version, which is the version of the library it binds (the
build reads it from here; the tests check it against the header)."""

__version__ = "0.2.0"

#: The oldest library the package works with, as MT_VERSION_NUMBER counts:
#: it calls the 0.2 additions (tokenizers, chat templates, document files).
MIN_LIBRARY_VERSION = 200
