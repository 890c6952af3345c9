//! The data path's entry points: `verbs` with the `verbs` feature; without it, `--verbs` is
//! refused and nothing else reaches here.

#[cfg(feature = "verbs")]
pub(crate) use super::verbs::{connect, init, release_held, serve};

/// With `--verbs`: where the QP work went (stderr), else nothing.
pub(crate) fn report_timing() {
    #[cfg(feature = "verbs")]
    if super::data::ENABLED.load(std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{}", super::verbs::timing_line());
    }
}

/// Without the `verbs` feature there is nothing to release.
#[cfg(not(feature = "verbs"))]
pub(crate) fn release_held() {}

/// Without the `verbs` feature: `--verbs` is refused.
#[cfg(not(feature = "verbs"))]
pub(crate) fn init(args: &super::args::Args) -> anyhow::Result<()> {
    if args.verbs.verbs.is_some() {
        anyhow::bail!("--verbs: this cm-ping was built without the `verbs` feature");
    }
    Ok(())
}

/// Without the `verbs` feature nothing reaches here (`init` refused `--verbs`).
#[cfg(not(feature = "verbs"))]
pub(crate) async fn serve(
    _cm: &ibcm::rt::Cm,
    _args: &super::args::Args,
    _counts: &super::counts::Counts,
    _inc: ibcm::rt::Incoming,
) -> anyhow::Result<()> {
    anyhow::bail!("--verbs: this cm-ping was built without the `verbs` feature")
}

/// Without the `verbs` feature nothing reaches here (`init` refused `--verbs`).
#[cfg(not(feature = "verbs"))]
pub(crate) async fn connect(
    _cm: &ibcm::rt::Cm,
    _args: &super::args::Args,
    _counts: &super::counts::Counts,
    _p: ibcm::proto::ConnectParams,
    i: u64,
) -> Option<ibcm::rt::Connection> {
    super::out::out(
        _args,
        format_args!("connection {i}: built without the `verbs` feature"),
    );
    None
}
