//! Integration tests: export.
