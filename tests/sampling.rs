//! Integration tests: sampling.
