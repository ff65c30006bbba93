"""The supported catalog databases, one module each behind `base.CatalogDialect`; the
registry that picks one for a URL (and refuses any other) is `catalog.engine`'s."""
