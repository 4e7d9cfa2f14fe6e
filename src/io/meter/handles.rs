//! Where a meter registers its handles: a fan-out of the process's
//! recorder (Prometheus under `serve`) and the EMF renderer, so one
//! recording reaches both.

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString, Unit,
};
use metrics_util::layers::{Fanout, FanoutBuilder};

use super::emf::Emf;

static METADATA: Metadata = Metadata::new(module_path!(), metrics::Level::INFO, None);

/// The process's own recorder (Prometheus under `serve`; none in Lambda),
/// as one branch of a fan-out.
struct Installed;

impl Recorder for Installed {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, meta: &Metadata<'_>) -> Counter {
        metrics::with_recorder(|r| r.register_counter(key, meta))
    }

    fn register_gauge(&self, key: &Key, meta: &Metadata<'_>) -> Gauge {
        metrics::with_recorder(|r| r.register_gauge(key, meta))
    }

    fn register_histogram(&self, key: &Key, meta: &Metadata<'_>) -> Histogram {
        metrics::with_recorder(|r| r.register_histogram(key, meta))
    }
}

/// Where a meter registers its handles: the process's recorder, and the
/// EMF renderer too when EMF is on. Register after installing Prometheus.
#[derive(Clone)]
pub struct Handles(Option<Emf>);

impl Handles {
    pub fn new(emf: Option<&Emf>) -> Self {
        Self(emf.cloned())
    }

    /// The renderer, when EMF is on.
    pub fn emf(&self) -> Option<&Emf> {
        self.0.as_ref()
    }

    fn fanout(&self) -> Fanout {
        let fanout = FanoutBuilder::default().add_recorder(Installed);
        match &self.0 {
            Some(emf) => fanout.add_recorder(emf.clone()).build(),
            None => fanout.build(),
        }
    }

    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.fanout()
            .register_counter(&key(name, labels), &METADATA)
    }

    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        self.fanout().register_gauge(&key(name, labels), &METADATA)
    }

    pub fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        self.fanout()
            .register_histogram(&key(name, labels), &METADATA)
    }
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    let labels = labels.iter().map(|(k, v)| Label::new(*k, (*v).to_owned()));
    let labels: Vec<Label> = labels.collect();
    Key::from_parts(name, labels)
}
