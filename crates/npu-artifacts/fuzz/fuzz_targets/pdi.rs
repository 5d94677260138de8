//! Fuzzes PDI identification (partial PDI, xclbin, emulated design) and the registration check:
//! they must never panic, and an emulated design that reads must write back the same bytes.
//! Every parse holds at most 8 bytes per input byte at its peak (the cost oracle).
#![no_main]

#[path = "common/cost.rs"]
mod cost;

use libfuzzer_sys::fuzz_target;
use npu_artifacts::design;
use npu_artifacts::emu::EmuDesign;
use npu_artifacts::pdi::{self, PdiKind};
use npu_artifacts::xclbin;

fuzz_target!(|data: &[u8]| {
    let _ = cost::check("xclbin::summarize", data.len(), 8, || {
        xclbin::summarize(data).map(|x| x.sections.len())
    });
    if let Ok(PdiKind::Emulated(d)) = cost::check("identify", data.len(), 8, || pdi::identify(data))
    {
        assert_eq!(d.to_pdi(), data);
    }
    if let Ok(d) = EmuDesign::from_pdi(data) {
        assert_eq!(d.to_pdi(), data);
    }
    if let Ok(image) = cost::check("extract_pdi", data.len(), 8, || xclbin::extract_pdi(data)) {
        assert!(matches!(pdi::identify(&image), Ok(PdiKind::Partial(_))));
    }
    // The first byte picks where the input splits into a PDI and an insts.bin.
    if let Some((&split, rest)) = data.split_first() {
        let at = usize::from(split).min(rest.len()) * 4 % (rest.len() + 1);
        let (p, i) = rest.split_at(at);
        let _ = cost::check("check_pair", data.len(), 8, || {
            design::check_pair(p, i).map(|_| ())
        });
    }
});
