"""Glue for training frameworks, one module each (`archive_manager.integrations.verl`,
`archive_manager.integrations.trl`).

Nothing here is imported by ``import archive_manager``, and importing this package imports no
framework: each module imports its framework only where it needs it, so a plain install needs
none of them (docs/integrations.md).  A framework at a version a module was not written
against is refused (`UnsupportedVersionError`, a `MissingDependencyError`) rather than misread.
"""
