//! `gpulse record` and `gpulse report`: one run of a command as a [`recording::Recording`] (device
//! and process timelines, findings as intervals, the companion's spans), its summary for people
//! and scripts ([`summary`]), and a self-contained HTML report ([`html`], charts in [`charts`]);
//! [`causes`] is where its GPU time went, by the ledger's causes.
//! The recording is fed live from the pipeline's snapshots and analysed windows
//! ([`recorder`]), or rebuilt from OTLP/JSON lines ([`otlp_json_reader`]). The command itself runs as
//! gpulse's child ([`child`]); [`tree`] tells its processes from the others on the same GPUs.

pub(crate) mod causes;
pub(crate) mod charts;
pub(crate) mod child;
pub(crate) mod html;
pub(crate) mod job;
pub mod otlp_json_reader;
pub(crate) mod recorder;
pub(crate) mod recording;
pub(crate) mod summary;
pub(crate) mod training_spans;
pub(crate) mod tree;
