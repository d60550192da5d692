//! The proxy against several in-process instances of one plugin: how calls
//! spread, and which failures go to another instance.

use std::sync::atomic::Ordering;
use std::time::Duration;

use jiff::Timestamp;
use kplug_proto::trace::TraceParent;
use kplug_proto::v1alpha1::ReconcileRequest;

use super::*;
use crate::proxy::testing::{
    Answer, Served as Instance, closed_address, declaration, listener, serve_plugin,
};
use crate::proxy::{Answered, ProxyConfig, Route};
use crate::registry::{Declaration, Registry, RegistryConfig};
use crate::v1alpha1::Operation;

/// A plain gRPC plugin answering every call with `answer`.
async fn plugin(answer: Answer) -> Instance {
    serve_plugin(answer, None).await
}

/// What a raw HTTP/2 server does with each stream it receives.
#[derive(Clone, Copy)]
enum Raw {
    /// RST_STREAM with REFUSED_STREAM: not processed, by definition.
    Refuse,
    /// Closes the connection with the stream open, as a process that dies
    /// mid-call: the call may have run.
    Cut,
}

/// A server that speaks HTTP/2 but never answers a call.
async fn raw(behaviour: Raw) -> Instance {
    let (listener, address) = listener().await;
    let instance = Instance::at(address);
    let seen = instance.calls.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = connection.accept().await {
                    seen.fetch_add(1, Ordering::SeqCst);
                    match behaviour {
                        Raw::Refuse => respond.send_reset(h2::Reason::REFUSED_STREAM),
                        Raw::Cut => {
                            drop(connection);
                            drop(respond);
                            return;
                        }
                    }
                }
            });
        }
    });
    instance
}

/// The plugin "spread" with an instance at each address, in order.
fn registered(registry: &Registry, addresses: &[&str]) -> Arc<Plugin> {
    for (i, address) in addresses.iter().enumerate() {
        registry
            .heartbeat(
                declaration("spread", &format!("i-{i}"), address),
                Timestamp::now(),
            )
            .expect("registered");
    }
    registry.get("spread").expect("the plugin")
}

async fn call(proxy: &Proxy, plugin: &Plugin) -> Result<Answered, ProxyError> {
    call_within(proxy, plugin, Duration::from_secs(5)).await
}

async fn call_within(
    proxy: &Proxy,
    plugin: &Plugin,
    timeout: Duration,
) -> Result<Answered, ProxyError> {
    proxy
        .call(
            plugin,
            Operation::Reconcile,
            ReconcileRequest::default(),
            timeout,
            &TraceParent::new_root(),
            Route::default(),
        )
        .await
}

/// Makes `count` calls one after the other; returns how many failed.
async fn calls(proxy: &Proxy, plugin: &Plugin, count: usize) -> usize {
    let mut failed = 0;
    for _ in 0..count {
        if call(proxy, plugin).await.is_err() {
            failed += 1;
        }
    }
    failed
}

#[tokio::test]
async fn idle_ready_instances_take_calls_in_turn_and_draining_ones_none() {
    let registry = Registry::new(RegistryConfig::default());
    let (a, b, c) = (
        plugin(Answer::Success).await,
        plugin(Answer::Success).await,
        plugin(Answer::Success).await,
    );
    registered(&registry, &[&a.address, &b.address, &c.address]);
    let plugin = {
        let draining = Declaration {
            draining: true,
            ..declaration("spread", "i-2", &c.address)
        };
        registry
            .heartbeat(draining, Timestamp::now())
            .expect("c drains");
        registry.get("spread").expect("the plugin")
    };
    let proxy = Proxy::new(ProxyConfig::default());
    assert_eq!(calls(&proxy, &plugin, 6).await, 0);
    assert_eq!((a.calls(), b.calls(), c.calls()), (3, 3, 0));
}

#[tokio::test]
async fn the_bound_on_calls_in_flight_holds_per_instance() {
    let registry = Registry::new(RegistryConfig::default());
    let (a, b) = (plugin(Answer::Held).await, plugin(Answer::Held).await);
    let plugin = registered(&registry, &[&a.address, &b.address]);
    let proxy = Proxy::new(ProxyConfig {
        max_in_flight: 1,
        ..ProxyConfig::default()
    });
    let first = call(&proxy, &plugin);
    let second = call(&proxy, &plugin);
    let third = async {
        // Once both instances hold a call, nothing is left.
        while a.calls() + b.calls() < 2 {
            tokio::task::yield_now().await;
        }
        let busy = call(&proxy, &plugin).await;
        a.release.notify_one();
        b.release.notify_one();
        busy
    };
    let (first, second, third) = tokio::join!(first, second, third);
    assert!(first.is_ok() && second.is_ok(), "{first:?} {second:?}");
    assert_eq!((a.calls(), b.calls()), (1, 1), "one each: the least busy");
    assert!(
        matches!(third, Err(ProxyError::Busy { limit: 1, .. })),
        "{third:?}"
    );
}

#[tokio::test]
async fn a_call_that_cannot_connect_goes_to_another_instance() {
    let registry = Registry::new(RegistryConfig::default());
    let live = plugin(Answer::Success).await;
    let plugin = registered(&registry, &[&closed_address(), &live.address]);
    let proxy = Proxy::new(ProxyConfig::default());
    assert_eq!(calls(&proxy, &plugin, 4).await, 0);
    assert_eq!(live.calls(), 4);
}

#[tokio::test]
async fn a_refused_stream_goes_to_another_instance_once() {
    let registry = Registry::new(RegistryConfig::default());
    let (refusing, live) = (raw(Raw::Refuse).await, plugin(Answer::Success).await);
    let plugin = registered(&registry, &[&refusing.address, &live.address]);
    let proxy = Proxy::new(ProxyConfig::default());
    assert_eq!(calls(&proxy, &plugin, 4).await, 0);
    assert_eq!(live.calls(), 4);
    assert!(refusing.calls() >= 1, "the refusing instance was tried");

    // Only once: with every instance refusing, the call fails after two.
    let (one, other) = (raw(Raw::Refuse).await, raw(Raw::Refuse).await);
    registry
        .delete("spread", &Default::default())
        .expect("deleted");
    let plugin = registered(&registry, &[&one.address, &other.address]);
    let error = call(&proxy, &plugin).await.expect_err("refused twice");
    assert!(matches!(error, ProxyError::Unavailable { .. }), "{error}");
    assert_eq!((one.calls(), other.calls()), (1, 1));
}

#[tokio::test]
async fn a_call_that_may_have_run_is_never_repeated() {
    let registry = Registry::new(RegistryConfig::default());
    // The plugin's own UNAVAILABLE, and a connection cut mid-call.
    for failing in [plugin(Answer::Unavailable).await, raw(Raw::Cut).await] {
        let live = plugin(Answer::Success).await;
        let plugin = registered(&registry, &[&failing.address, &live.address]);
        let proxy = Proxy::new(ProxyConfig::default());
        let failed = calls(&proxy, &plugin, 4).await;
        assert!(failing.calls() >= 1, "the failing instance was called");
        assert_eq!(failed, failing.calls(), "every call it took failed");
        assert_eq!(live.calls(), 4 - failed, "and none went on to the other");
        registry
            .delete("spread", &Default::default())
            .expect("deleted");
    }
}

#[tokio::test]
async fn channels_of_instances_that_leave_are_dropped() {
    let registry = Arc::new(Registry::new(RegistryConfig::default()));
    let proxy = Arc::new(Proxy::new(ProxyConfig::default()));
    let forget = tokio::spawn(proxy.clone().forget_departed(registry.clone()));
    let (a, b) = (plugin(Answer::Success).await, plugin(Answer::Success).await);
    let plugin = registered(&registry, &[&a.address, &b.address]);
    assert_eq!(calls(&proxy, &plugin, 2).await, 0);
    assert_eq!(proxy.channels(), 2);

    assert!(registry.deregister("spread", "i-1", &b.address, Timestamp::now()));
    let dropped = tokio::time::timeout(Duration::from_secs(5), async {
        while proxy.channels() > 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(dropped.is_ok(), "b's channel outlived b");
    forget.abort();
}

#[tokio::test]
async fn failures_name_the_instance_and_say_what_happened_in_words() {
    let registry = Registry::new(RegistryConfig::default());
    let proxy = Proxy::new(ProxyConfig::default());
    let closed = closed_address();
    let cut = raw(Raw::Cut).await;
    let down = plugin(Answer::Unavailable).await;
    let cases = [
        (
            closed.as_str(),
            "refused the connection (nothing listens there)",
        ),
        (&cut.address, "closed the connection during the call"),
        (&down.address, "answered UNAVAILABLE: the database is down"),
    ];
    for (address, what) in cases {
        let plugin = registered(&registry, &[address]);
        let error = call(&proxy, &plugin).await.expect_err("no answer");
        assert!(matches!(error, ProxyError::Unavailable { .. }), "{error}");
        assert_eq!(
            error.to_string(),
            format!("plugin spread instance i-0 at {address} {what}")
        );
        registry
            .delete("spread", &Default::default())
            .expect("deleted");
    }
}

#[tokio::test]
async fn a_plugin_that_never_answers_is_past_its_deadline_whichever_timer_fires_first() {
    let registry = Registry::new(RegistryConfig::default());
    let proxy = Proxy::new(ProxyConfig::default());
    let silent = plugin(Answer::Held).await;
    let plugin = registered(&registry, &[&silent.address]);
    // kplug's timer and tonic's own for the grpc-timeout race each time.
    for _ in 0..20 {
        let error = call_within(&proxy, &plugin, Duration::from_millis(20))
            .await
            .expect_err("never answers");
        assert!(
            matches!(error, ProxyError::DeadlineExceeded { .. }),
            "{error}"
        );
        assert!(
            error.to_string().ends_with("did not answer within 20ms"),
            "{error}"
        );
    }
}
