//! The maintenance schedule the updaters read: the Linux schedule file
//! (`svc_core::maintenance::parse_schedule_file`, read by `svc-upgrade`) and the Kubernetes
//! schedule JSON (`parse_kube_schedule`, read by the controller). Written by the agent, but a
//! file on disk or a Secret anyone with write access can change.
//!
//! Properties: no panic; deterministic; parsed windows rendered again (`render_schedule_file`,
//! `render_kube_schedule`) parse to the same windows; `in_window` answers for any instant.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use svc_core::maintenance::{
    in_window, parse_kube_schedule, parse_schedule_file, render_kube_schedule, render_schedule_file,
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let linux = parse_schedule_file(text);
    assert_eq!(linux, parse_schedule_file(text), "parse is not deterministic");
    if let Ok(windows) = &linux {
        let rendered = render_schedule_file(windows);
        assert_eq!(
            parse_schedule_file(&rendered).as_ref(),
            Ok(windows),
            "round trip through\n{rendered}"
        );
        for w in windows {
            assert!(w.start < w.end, "inverted window accepted: {w:?}");
            let _ = in_window(
                windows,
                w.start + (w.end.duration_since(w.start).unwrap_or_default() / 2),
            );
        }
        let _ = in_window(
            windows,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        );
    }
    let kube = parse_kube_schedule(text);
    assert_eq!(kube, parse_kube_schedule(text), "parse is not deterministic");
    if let Ok(windows) = &kube {
        let rendered = render_kube_schedule(windows);
        assert_eq!(
            parse_kube_schedule(&rendered).as_ref(),
            Ok(windows),
            "round trip through\n{rendered}"
        );
        // The Linux file carries whole seconds: windows on second boundaries survive it too.
        if windows
            .iter()
            .all(|w| whole_seconds(w.start) && whole_seconds(w.end))
        {
            let file = render_schedule_file(windows);
            assert_eq!(
                parse_schedule_file(&file).as_ref(),
                Ok(windows),
                "Kubernetes → file via\n{file}"
            );
        }
    }
});

fn whole_seconds(t: SystemTime) -> bool {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.subsec_nanos() == 0,
        Err(e) => e.duration().subsec_nanos() == 0,
    }
}
