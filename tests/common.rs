//! Helpers shared by the integration-test modules.
