//! Diagnosis: rules over the export window and each workload's history that say why a job is slow
//! or about to fail, as `Finding`s.
