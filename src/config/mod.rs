//! Configuration: command-line flags, environment (`GPULSE_*` and the standard `OTEL_*`
//! variables) and the TOML config file, merged with one precedence (flags > environment > file >
//! defaults) into one validated `Config`.

pub mod otlp;
