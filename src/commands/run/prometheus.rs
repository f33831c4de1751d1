//! `gpulse run`'s `/metrics` (`--prometheus-addr`): the endpoint of `export::prometheus`, fed by
//! the `View` the `Analyzer` publishes after each window. A task waits on the view channel and
//! rebuilds the exposition; scrapes only read it.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::PrometheusSettings;
use crate::export::prometheus::{server, Published};
use crate::export::resource::NodeIdentity;
use crate::pipeline::ViewReceiver;
use crate::schema::MetricSwitches;

/// The two tasks of the endpoint; aborted when dropped with the pipeline.
pub(crate) struct MetricsEndpoint {
    server: tokio::task::JoinHandle<()>,
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.server.abort();
        self.follower.abort();
    }
}

/// Binds the endpoint and follows the analyzer's views.
///
/// # Errors
/// The address cannot be bound.
pub(crate) async fn start(
    addr: SocketAddr,
    settings: PrometheusSettings,
    switches: MetricSwitches,
    node: NodeIdentity,
    mut views: ViewReceiver,
) -> std::io::Result<MetricsEndpoint> {
    let published = Arc::new(Published::new(settings, node).with_switches(switches));
    let (_, server) = server::serve(addr, Arc::clone(&published)).await?;
    let follower = tokio::spawn(async move {
        loop {
            let view = views.borrow_and_update().clone();
            if let Some(view) = view {
                // Off the async workers: 64 GPUs × 1024 processes take ~0.1 s to build
                // (`cargo bench --bench prometheus`), which must not stall the pipeline's tasks.
                let published = Arc::clone(&published);
                let built = tokio::task::spawn_blocking(move || {
                    published.update(&view.attributed, &view.training, &view.findings);
                })
                .await;
                if let Err(e) = built {
                    tracing::error!("/metrics could not be rebuilt from this window: {e}");
                }
            }
            if views.changed().await.is_err() {
                break;
            }
        }
    });
    Ok(MetricsEndpoint { server, follower })
}
