//! The registry's figures, read at scrape time: nothing on the heartbeat
//! path updates a metric.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::Registry;

/// Exposes `kplug_plugins{ready}` and `kplug_plugin_expiries_total`.
#[derive(Debug)]
pub struct RegistryCollector(pub Arc<Registry>);

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Collector for RegistryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let census = self.0.census();
        let mut plugins = encoder.encode_descriptor(
            "kplug_plugins",
            "Registered plugins, by whether they are Ready",
            None,
            MetricType::Gauge,
        )?;
        for (ready, count) in [("true", census.ready), ("false", census.not_ready)] {
            let count = i64::try_from(count).unwrap_or(i64::MAX);
            ConstGauge::new(count).encode(plugins.encode_family(&[("ready", ready)])?)?;
        }
        let expiries = ConstCounter::new(census.expired);
        expiries.encode(encoder.encode_descriptor(
            "kplug_plugin_expiries",
            "Registrations removed because no heartbeat came within their TTL",
            None,
            expiries.metric_type(),
        )?)?;
        self.encode_canaries(&mut encoder)?;
        self.encode_shadows(&mut encoder)
    }
}

impl RegistryCollector {
    /// `kplug_canary_calls_total{plugin,track,outcome}` and
    /// `kplug_canary_withdrawals_total{plugin}`, with series for plugins
    /// with a canary; declared without any, as every other family is.
    fn encode_canaries(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let judges = self.0.canaries.lock();
        let mut calls = encoder.encode_descriptor(
            "kplug_canary_calls",
            "Calls to plugins with canary instances, by side and how they ended",
            None,
            MetricType::Counter,
        )?;
        for (plugin, record) in &judges.0 {
            let mut counted: Vec<_> = record.calls.iter().collect();
            counted.sort_by_key(|((track, outcome), _)| (track.as_str(), outcome.as_str()));
            for ((track, outcome), count) in counted {
                let labels = [
                    ("plugin", plugin.as_str()),
                    ("track", track.as_str()),
                    ("outcome", outcome.as_str()),
                ];
                ConstCounter::new(*count).encode(calls.encode_family(&labels)?)?;
            }
        }
        let mut withdrawals = encoder.encode_descriptor(
            "kplug_canary_withdrawals",
            "Canaries kplug withdrew for failing more often than the stable instances",
            None,
            MetricType::Counter,
        )?;
        for (plugin, record) in &judges.0 {
            ConstCounter::new(record.withdrawals)
                .encode(withdrawals.encode_family(&[("plugin", plugin.as_str())])?)?;
        }
        Ok(())
    }

    /// `kplug_shadow_copies_total{plugin,result}`, with series for plugins
    /// whose reconciles were copied to a shadow.
    fn encode_shadows(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let records = self.0.shadows.lock();
        let mut copies = encoder.encode_descriptor(
            "kplug_shadow_copies",
            "Reconciles sampled for a shadow, by how the shadow's answer compared with the caller's",
            None,
            MetricType::Counter,
        )?;
        for (plugin, record) in &records.0 {
            for (result, count) in [
                ("same", record.same),
                ("different", record.different),
                ("failed", record.failed),
                ("skipped", record.skipped),
            ] {
                let labels = [("plugin", plugin.as_str()), ("result", result)];
                ConstCounter::new(count).encode(copies.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
