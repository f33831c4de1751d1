//! Integration tests: attribution.
