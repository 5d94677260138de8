//! The real ROCR from Debian (`libhsa-runtime64-1`, 5.2.3): it has no AIE support and, on a host
//! without `/dev/kfd`, cannot even initialise. Opening it through discovery must fail with the
//! runtime's own status and text, not a panic and not a guess.

use hsa_core::discovery::{RootKind, SearchEnv};
use hsa_core::sys::Status;
use hsa_core::{ApiSource, Device, DeviceOptions, HsaApi, HsaError};

#[test]
#[cfg_attr(
    not(system_rocr),
    ignore = "Debian's libhsa-runtime64-1 is not installed (apt-get install libhsa-runtime64-1)"
)]
fn debian_rocr_is_found_by_discovery_and_fails_to_open_with_its_own_status() {
    let t = tempfile::tempdir().unwrap();
    // Only the system loader can find it: no ROCM_PATH, no pip ROCm, no /opt/rocm.
    let env = SearchEnv {
        opt_rocm: t.path().join("no-rocm"),
        ..Default::default()
    };
    let api =
        HsaApi::discover_in(None, &env).expect("the system loader finds libhsa-runtime64.so.1");
    match api.source() {
        ApiSource::Loaded { path, root } => {
            assert_eq!(*root, RootKind::SystemLoader);
            assert_eq!(path.to_str(), Some("libhsa-runtime64.so.1"));
        }
        other => panic!("unexpected source {other:?}"),
    }
    // 5.2.3 predates vmem and dmabuf export: they must be reported missing, not fatal.
    let missing = api.fns().missing_optional();
    assert!(
        missing.contains(&"hsa_amd_vmem_handle_create"),
        "{missing:?}"
    );
    assert!(
        missing.contains(&"hsa_amd_portable_export_dmabuf"),
        "{missing:?}"
    );

    let err = Device::open(api, DeviceOptions::default()).unwrap_err();
    let text = err.to_string();
    let HsaError::Init {
        status,
        message,
        library,
    } = &err
    else {
        panic!("expected hsa_init to fail, got: {text}");
    };
    assert!(library.contains("libhsa-runtime64.so.1"), "{text}");
    if !std::path::Path::new("/dev/kfd").exists() {
        assert_eq!(*status, Status::ERROR_OUT_OF_RESOURCES, "{text}");
        assert!(
            message.starts_with("HSA_STATUS_ERROR_OUT_OF_RESOURCES"),
            "{text}"
        );
    } else {
        assert!(!status.is_ok(), "{text}");
    }
    assert!(
        text.starts_with("hsa_init in libhsa-runtime64.so.1"),
        "{text}"
    );
}
