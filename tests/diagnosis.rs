//! Integration tests: diagnosis.
