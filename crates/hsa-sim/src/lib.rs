//! hsa-sim: a software AMD XDNA NPU (a ROCR "AIE agent") behind ROCR's C ABI.
//!
//! Built as a `cdylib` it is a drop-in `libhsa-runtime64.so` for the AIE path; as an `rlib`
//! it fills an [`hsa_core::sys::HsaFns`] table directly ([`fns`]). Every number is ROCR's
//! (`rocr-aie.md`). It behaves as an AIE agent on a machine with no NPU: a CPU agent and an
//! AIE agent (`aie2` or `aie2p`), the AIE agent's three pools, a 64 MiB device heap, the
//! 64-packet SINGLE queue with a synchronous doorbell, signals, vmem and its export
//! (memfd-backed), and reference kernels in place of AIE cores, chosen by an emulated design's
//! `main.pdi` (see `npu_artifacts::emu`).
//!
//! # Modules
//! - [`config`]: agent generation, profile, watchdog timeout (environment or [`set_config`]).
//! - [`profile`]: the ROCR releases the emulator can behave as, and what differs between them.
//! - `runtime`: `hsa_init`/`hsa_shut_down` reference counting, `hsa_system_get_info`.
//! - `agents`: agents and pools and their info queries.
//! - `memory`: pool allocations (one memfd each), the device heap, the address registry,
//!   dmabuf export refusals. `vmem`: `hsa_amd_vmem_*`.
//! - `regions`: the core region API older clients use (`hsa_agent_iterate_regions`, ...).
//! - `signal`: signals and waits. `queue`: creation and indexes. `dispatch`: the doorbell,
//!   command chains, failure reporting, and packet decoding per generation. `rules`: the
//!   checks. `kernels`: reference kernels.
//! - [`mod@counters`]: created/destroyed counts for leak tests, doorbells and chains.
//!   `status`: status strings and [`last_error`].
//!
//! # Profiles
//!
//! Each [`Profile`] is a ROCR release users install, and fails exactly as that runtime does
//! (`HSA_SIM_PROFILE`, default `rocr-newest`): `rocm-7.0` (G1a packets), `rocr-late-2025`
//! (G1b), `rocr-g2-2026-05` (the first G2 release), `rocr-g2-2026-07` (G2 packets with
//! full ELF, and an AIE loader for `PdiInsts` hsacos whose kernel objects no packet names),
//! `rocr-newest` (G2 with full ELF) and `kernel-object` (AIE hsacos loaded with the executable
//! API, packets naming kernel objects). The agent's
//! generation (`HSA_SIM_AGENT_NAME`) is separate: it decides which TXN generation runs,
//! whatever name the profile reports. `HSA_AMD_SYSTEM_INFO_BUILD_VERSION` names the profile
//! (`hsa-sim 0.1.0 (software AIE agent, profile rocm-7.0)`); [`profile_of_build_version`]
//! reads it back.
//!
//! # The doorbell
//!
//! A store to a queue's doorbell signal (`hsa_signal_store_screlease` or `_relaxed`; the value
//! is ignored) runs every packet from the read index to the write index before it returns.
//! Each packet is decoded for the profile's generation, checked against the rules below, run,
//! retired (read index past it) and its completion signal decremented by 1 (G2, G1b; handle 0
//! = none; G1a has none). The first failing packet stops the batch: the packets before it are
//! retired, the failing one and the rest do not run, and the failure is reported as the
//! profile's runtime reports it (`rocr-aie.md` §5.6):
//!
//! | | `rocm-7.0` | `rocr-late-2025` | `rocr-g2-2026-05` | `rocr-g2-2026-07` | `rocr-newest` | `kernel-object` |
//! |---|---|---|---|---|---|---|
//! | a failed batch | **silent**: no callback, no suspension, read index moved to the write index | **abort**: one line on stderr naming the profile, status and detail, then `abort()` | **abort** | queue suspended, error callback called with the status; with no callback, print and `abort()` (ROCR's default handler); a batch refused before submission retires nothing (read index at its first packet; [`Profile::checks_whole_batch_first`]) | queue suspended, error callback called with the status; with no callback, print and `abort()` (ROCR's default handler); a batch refused before submission retires nothing (read index at its first packet; [`Profile::checks_whole_batch_first`]) | as `rocr-newest` |
//!
//! Every failure is kept in [`last_error`] (C: `hsa_sim_last_error`) and
//! [`last_error_status`], logged with `tracing::warn!`, and counted in
//! [`Counters::packets_failed`].
//!
//! # Rules and the status each failure gives, per profile
//!
//! "—" marks a rule that cannot arise under that profile's packets; "runs" a packet the
//! runtime does not check. Doorbell rules are reported as the table above says. Sections are
//! of `rocr-aie.md` unless marked "hsaco" (`rocr-aie-hsaco.md`). *Inferred* marks a status the
//! reference does not give for that release: the emulator then keeps the strict answer.
//!
//! | Rule | Enforced by (real stack) | Source | `rocm-7.0` | `rocr-late-2025` | `rocr-g2-2026-05` | `rocr-g2-2026-07` | `rocr-newest` | `kernel-object` |
//! |---|---|---|---|---|---|---|---|---|
//! | queue size not 64 | ROCR, at creation | §5.1 | `INVALID_ARGUMENT` | same | same | same | same | same |
//! | queue type MULTI or COOPERATIVE | ROCR, at creation | §5.1 | `INVALID_QUEUE_CREATION` | same | same | same | same | same |
//! | queue on the CPU agent or an unknown agent | ROCR, at creation | §5.1 | `INVALID_AGENT` | same | same | same | same | same |
//! | G2 header type not READY (0), opcode not KMQ (0) | ROCR | §2.1, §5.4 | — | — | runs (no check) | `INVALID_PACKET_FORMAT` | `INVALID_PACKET_FORMAT` | opcode only: `INVALID_PACKET_FORMAT` (the header is not read) |
//! | G2 `pdi_patch_offset` non-zero (full ELF) | ROCR (`BuildFullElfCommand`) | ROCR `core/driver/xdna/README.md` @ `159fb22f` | — | — | read as reserved: the control code runs as insts (`ERROR`, abort) | runs on aie2p; refused as `dispatch/full_elf.rs` lists | same | — (word 56 reserved, not read) |
//! | G1 header not 0 | ROCR | §2.2 | runs (`assert` compiled out) | `INVALID_PACKET_FORMAT` | — | — | — | — |
//! | G1 AmdFormat not 3 (G1a) / 200 (G1b), state not NEW | ROCR | §2.2 | runs (`assert` compiled out; a G2 packet is read as G1a, observed) | `INVALID_PACKET_FORMAT` | — | — | — | — |
//! | G1 payload NULL or unreadable | ROCR | §2.2; rocm70-observed | the process aborts (ROCR dereferences it: SIGSEGV, observed) | `INVALID_PACKET_FORMAT` | — | — | — | — |
//! | G1 count not 5+3N, data[0..2] not [3, 0] | ROCR / firmware | §2.2 | `INVALID_PACKET_FORMAT` (*inferred*) | `INVALID_PACKET_FORMAT` | — | — | — | — |
//! | G1 ERT opcode not START_CU | ROCR | §2.2; rocm70-observed item 6 | the ringing thread hangs forever (observed) | `INVALID_PACKET_FORMAT` | — | — | — | — |
//! | a queue's first doorbell names only PDIs an earlier queue's first doorbell named | ROCR's agent-wide PDI cache | rocm70-observed item 4 | dropped silently, no context (observed; `dispatch/rocm70.rs`) | — | — | — | — | — |
//! | every doorbell | ROCR | rocm70-observed item 4 | a new hardware context (`hw_context_builds`) | — | — | — | — | — |
//! | instruction buffer at heap offset in [16, 32) or [48, 64) MiB | ROCR's address mask | rocm70-observed item 1 | the device runs the bytes 16 MiB below | — | — | — | — | — |
//! | a G1a payload submitted again | ROCR translates it in place | rocm70-observed item 2 | `INVALID_ALLOCATION`, silent | — | — | — | — | — |
//! | `hsa_shut_down` | ROCR | rocm70-observed item 9 | leaves the accel fd open (a memfd named `hsa-sim-accel0-…`) | closes | closes | closes | closes | closes |
//! | G1a packet index ≥ 64 (ROCm 7.0 reads past the ring) | ROCR | §5.2 | `INVALID_PACKET_FORMAT` | — (wraps) | — (wraps) | — (wraps) | — (wraps) | — (wraps) |
//! | write index more than 64 ahead of the read index | (ring overflow) | §5.2 | `INVALID_ARGUMENT` | same | same | same | same | same |
//! | one batch's chain exceeds the 4 KiB chain buffer | amdxdna, unsplit by ROCR | §5.2, §7; hsaco §4 | `ERROR` past 4096 bytes at 52 + 4·(6+3N) per START_CU command (40 of N=2 fit) | same | `ERROR` past 4096 bytes at 52 + 4·(8+2N) per packet (40 of N=2, 31 of N=6 fit) | never: split into chains of 52 + 4·(6+2N) (44 of N=2 each) | never: split into chains of 52 + 4·(6+2N) (44 of N=2 each) | never: split into chains of 52 + 4·(6+2N) per `PdiInsts` command (44 of N=2), 60 bytes per `FullElf` (68) |
//! | G2 `num_kernargs` > 0 with NULL `kernarg_address` | ROCR | §2.1; hsaco §4 | — | — | `INVALID_ARGUMENT` | `INVALID_PACKET_FORMAT`, after the PDI and instruction buffer resolve (`INVALID_ALLOCATION` first) | `INVALID_ARGUMENT` (see the differences) | `INVALID_PACKET_FORMAT` |
//! | completion signal handle not a live signal | ROCR | §5.3 | — (no signal) | `INVALID_SIGNAL` | `INVALID_SIGNAL` | `INVALID_SIGNAL` | `INVALID_SIGNAL` | `INVALID_SIGNAL` |
//! | kernarg buffer (G2), insts, or an argument not a known AIE allocation (CPU pool, unknown, vmem without AIE access) or smaller than its declared size | ROCR `FindBOHandle` / `FindDriverMemoryHandle` | §4.1, §5.4 | `INVALID_ALLOCATION` | same | same | same | same | kernarg buffer or argument not an allocation: `INVALID_ALLOCATION`; an argument size past its allocation, or more arguments than the kernarg buffer holds: `INVALID_PACKET_FORMAT` |
//! | `insts_size` zero or not a multiple of 4 (G1 counts dwords: only zero arises) | ROCR | §2.1, §5.4 | `INVALID_ARGUMENT` (*inferred*) | same (*inferred*) | same (*inferred*) | `INVALID_ARGUMENT` | `INVALID_ARGUMENT` | — (the loader refuses it) |
//! | PDI not a known allocation | ROCR | §4.1, §5.4 | `INVALID_ALLOCATION` | same | same | same | same | — (the loader places it) |
//! | a 33rd distinct PDI on one queue | ROCR (32-bit CU mask) | §5.4; hsaco §4 | `OUT_OF_RESOURCES` (*inferred*) | same (*inferred*) | same (*inferred*) | `OUT_OF_RESOURCES` | `OUT_OF_RESOURCES` | `OUT_OF_RESOURCES` (each load is a new PDI; the cache empties after an executable destroy) |
//! | PDI not in the device heap ("aie2_config_cu: Invalid BO type") | amdxdna | §4.1, §7 | `ERROR` | same | same | same | same | — (the loader places it) |
//! | insts not in the device heap (the firmware gets a wrong device address) | firmware | §2.1 | `ERROR` | same | same | same | same | — (the loader places it) |
//! | PDI is a real partial PDI ("PPDI") or an xclbin | emulator limit | — | `NOT_SUPPORTED` | same | same | same | same | same; a full ELF whose control code is real NPU code: `NOT_SUPPORTED` |
//! | PDI unrecognised or a broken emulated design; insts rejected by the TXN parser | firmware | — | `ERROR` | same | same | same | same | same |
//! | insts built for the other generation (aie2 ↔ npu1/devGen 3, aie2p ↔ npu2/devGen 4) | firmware hangs | §7 (TDR) | `ERROR` after ROCm 7.0's 50 ms `WAIT_CMD` ("WAIT_CMD timed out") | `ERROR` after the watchdog ("Device isn't making progress") | same | same | same | same |
//! | fewer arguments than the TXN's DDR patches use, or one smaller than its `min_arg_size`; fewer or smaller than the emulated design's buffers | firmware / emulator | — | `INVALID_ALLOCATION` | same | same | same | same | same |
//! | `fault` design | device | — | `ERROR` ("device error") | same | same | same | same | same |
//! | `hang` design | device + TDR | §5.2, §7 | `ERROR` after 50 ms | `ERROR` after the watchdog | same | same | same | same |
//! | `hsa_amd_vmem_map` of a handle from an AIE pool | ROCR ("only supported for KFD") | §4.2 | `INVALID_AGENT` | `INVALID_AGENT` | works | works | works | works |
//! | `hsa_amd_vmem_import_shareable_handle` (no GPU agent) | ROCR (KFD only in 2025) | §4.3 | `INVALID_ALLOCATION` | `INVALID_ALLOCATION` | works (*inferred*) | works | works | works |
//! | `hsa_amd_vmem_export_shareable_handle` of an AIE-pool handle | ROCR | hsaco §6, §4.2 | `ERROR` | `ERROR` | `ERROR` (unconfirmed: strict) | a memfd sealed against shrink and grow | a memfd sealed against shrink and grow | a memfd sealed against shrink and grow |
//! | `hsa_amd_vmem_export_shareable_handle` of an imported handle | ROCR | hsaco §6 | `ERROR` | same | same | same | same | same |
//! | vmem unmap while an agent still has access | ROCR `VMemoryHandleUnmap` (removes the access itself, every release read) | ROCR suites (`test_memory.cc`) | works | works | works | works | works | works |
//! | vmem address free while mappings remain | ROCR | §4.2 | `RESOURCE_FREE` | same | same | same | same | same |
//! | vmem handle, reservation or mapping unknown | ROCR | §4.2 | `INVALID_ALLOCATION` | same | same | same | same | same |
//! | `hsa_amd_portable_export_dmabuf` of AIE memory (pool allocation, or vmem mapping of an AIE handle: *inferred*) | ROCR | §4.3; hsaco §6 | `ERROR` (not implemented) | `ERROR` | `ERROR` | `ERROR` | `ERROR` | same |
//! | `hsa_amd_portable_export_dmabuf` of CPU-pool memory / of no allocation | ROCR | §4.3 | `INVALID_AGENT` / `INVALID_ALLOCATION` | same | same | same | same | same |
//! | `hsa_amd_portable_close_dmabuf(-1)` after a refused export | ROCR | hsaco §6 | `SUCCESS` | same | same | same | same | same |
//! | `hsa_amd_portable_close_dmabuf` of an open fd (a vmem export) / of no open fd | ROCR `DmaBufClose` (`close(2)`) | ROCR suites (`test_memory.cc`) | closes it: `SUCCESS` / `RESOURCE_FREE` | same | same | same | same | same |
//! | `hsa_amd_agent_memory_pool_get_info` `ACCESS` | ROCR `GetAgentPoolInfo` | ROCR suites | owner or CPU: ALLOWED_BY_DEFAULT; AIE asking about a CPU pool: DISALLOWED_BY_DEFAULT | same | same | same | same | same |
//! | `hsa_amd_memory_lock_to_pool` with a pool not the CPU's / naming the AIE agent | ROCR | ROCR suites | `INVALID_MEMORY_POOL` / `INVALID_AGENT` | same | same | same | same | same |
//! | `hsa_amd_memory_pool_can_migrate` | ROCR `CanMigrate` (not implemented) | ROCR suites | `OUT_OF_RESOURCES`, `false` | same | same | same | same | same |
//! | `hsa_amd_interop_map_buffer` | ROCR (KFD GPU nodes only) | §4.3 | `ERROR` | same | same | same | same | same |
//! | `hsa_amd_pointer_info` of AIE pool memory | ROCR `PtrInfo` | ROCR suites (`test_memory.cc`) | `UNKNOWN` (KFD's thunk) | same | same (*inferred*) | `HSA`, owner the AIE agent (*inferred*) | `HSA`, owner the AIE agent (*inferred*) | `HSA`, owner the AIE agent |
//! | a G2 batch with a packet the runtime refuses (decoding, unknown buffer, 33rd PDI) | ROCR builds the batch before submitting | ROCR suites (`PdiCacheRolledBackOnFailedBatch`) | — | — | packets before it run | nothing runs; signals keep their counts | nothing runs; signals keep their counts | nothing runs |
//! | `hsa_amd_agents_allow_access` or `hsa_amd_memory_lock` naming the AIE agent | ROCR | §4.1, §4.3 | `INVALID_AGENT` | same | same | same | same | same |
//! | device-heap allocation > 64 MiB / heap full | ROCR | §4.1 | `INVALID_ALLOCATION` / `OUT_OF_RESOURCES` | same | same | same | same | same |
//!
//! Names: `HSA_AGENT_INFO_NAME` is always `aie2` and `HSA_AMD_AGENT_INFO_PRODUCT_NAME`
//! `AIE-ML` under `rocm-7.0`; the later profiles report `aie2`/`aie2p` by generation and the
//! product name (§3).
//!
//! # The `kernel-object` profile (`rocr-aie-hsaco.md`)
//!
//! Every profile exports the executable API (`hsa_code_object_reader_create_from_memory`,
//! `hsa_code_object_reader_destroy`, `hsa_executable_create_alt`,
//! `hsa_executable_load_agent_code_object`, `hsa_executable_freeze`,
//! `hsa_executable_get_symbol_by_name`, `hsa_executable_symbol_get_info`,
//! `hsa_executable_destroy`). Only `kernel-object` has ROCR's AIE section loader. The others
//! send every code object down ROCR's GPU loader, which cannot determine an ISA for an AIE
//! hsaco and fails the load with `INVALID_CODE_OBJECT` (ROCR `loader/executable.cpp`,
//! `LoadCodeObject`: "failed to determine code object's ISA"); that failure is how a client
//! tells a G2 runtime from a kernel-object one (hsaco §1). The wrong packet form fails both
//! ways: a G2 packet on `kernel-object` is a descriptor whose first u32 is not 1
//! (`INVALID_PACKET_FORMAT`), and a kernel-object packet on a G2 profile names an instruction
//! buffer no allocation holds (`INVALID_ALLOCATION`; the instruction buffer is resolved before
//! its size is checked).
//!
//! Loading, in ROCR's order (hsaco §3; `kernel-object` only unless stated):
//!
//! | Rule | Status |
//! |---|---|
//! | executable unknown / reader unknown or destroyed (every profile) | `INVALID_EXECUTABLE` / `INVALID_CODE_OBJECT_READER` |
//! | executable already frozen (every profile) | `FROZEN_EXECUTABLE` |
//! | not the AIE agent, or no AIE section (the GPU path; every profile) | `INVALID_CODE_OBJECT` |
//! | AIE sections, none named like the agent's arch (`aie2` Phoenix, `aie2p` Strix) | `INCOMPATIBLE_ARGUMENTS` |
//! | the arch section breaks a section rule (hsaco §5.3, `npu_artifacts::hsaco`) | `INVALID_CODE_OBJECT` |
//! | a kernel name already defined in the executable for the agent (before any placement, and before the rules below) | `VARIABLE_ALREADY_DEFINED` |
//! | `kind >= 2`; `num_cols` 0 or above the agent's columns (Phoenix 4, Strix 8); `PdiInsts` without a PDI; a `FullElf` whose nested ELF is broken (also any `FullElf` in an `aie2` section), lacks the kernel, disagrees on `kernarg_size` or has no PDI site | `INVALID_CODE_OBJECT` |
//! | the device heap cannot hold a blob | `OUT_OF_RESOURCES` |
//!
//! A failed load frees what it placed. Each distinct `PdiInsts` blob is copied once into the
//! device heap; a `FullElf` kernel's PDIs are placed per kernel and its control code kept on
//! the host. `KERNEL_OBJECT` reads 0 until `hsa_executable_freeze`, then the address of a
//! descriptor whose first u32 is 1; `hsa_executable_destroy` frees the blobs, drops the
//! descriptors and, if a kernel was `PdiInsts`, empties every queue's PDI cache. Symbols are
//! keyed by (name, agent): a NULL agent finds no AIE kernel (`INVALID_SYMBOL_NAME`).
//!
//! Dispatch (hsaco §4): every packet of a doorbell batch is checked before any runs, and a
//! refusal fails the whole batch with nothing retired:
//!
//! | Rule | Status |
//! |---|---|
//! | opcode not KMQ (0) | `INVALID_PACKET_FORMAT` |
//! | kernel object NULL, its first u32 not 1 (a G2 packet's instruction address), or not a descriptor of a live executable | `INVALID_PACKET_FORMAT` |
//! | a kernel of another kind than the batch's first (one kind per doorbell batch) | `INVALID_PACKET_FORMAT` |
//! | `FullElf` with `num_kernargs` other than its ELF's argument count | `INVALID_PACKET_FORMAT` |
//! | `num_kernargs` > 0 with a NULL `kernarg_address` | `INVALID_PACKET_FORMAT` |
//! | kernarg buffer not a runtime allocation the agent can use | `INVALID_ALLOCATION` |
//! | more arguments than 16-byte slots between `kernarg_address` and the end of its allocation | `INVALID_PACKET_FORMAT` |
//! | an argument address not a registered allocation (even with size 0) | `INVALID_ALLOCATION` |
//! | an argument size past the end of its allocation | `INVALID_PACKET_FORMAT` |
//! | a 33rd distinct PDI on the queue | `OUT_OF_RESOURCES` |
//! | a `PdiInsts` command over 2047 dwords (`7 + 2N`: more than 1020 arguments) | `INVALID_PACKET_FORMAT` |
//! | completion signal not live | `INVALID_SIGNAL` |
//!
//! Then the device: a `PdiInsts` kernel runs as a G2 packet does; a `FullElf` kernel's control
//! code is copied fresh into a device-heap buffer of `ctrl_size + 16 KiB` for every packet
//! and patched there (`Address64`: the PDI's device address; `ShimDma48`: `base = ((w2 &
//! 0xFFFF) << 32 | w1) + arg + addend + 0x80000000`, `w1 = base & !3`, `w2 = (w2 &
//! 0xFFFF0000) | (base >> 32)`). Commands go in chains of at most 4096 bytes at `52 + 4·arg_cnt`
//! bytes a command, `arg_cnt = 6 + 2N` for `PdiInsts` (count `7 + 2N` less one: 44 commands of
//! two arguments a chain) and 2 for `FullElf` (68 a chain). The hardware context is sized per
//! batch: `max(current columns unless the kind changed, the batch's widest num_cols)`,
//! rebuilt when the kind changed, a PDI was added or more columns are needed, so it grows
//! within a mode and is sized afresh on a switch ([`Counters::hw_context_builds`],
//! [`Counters::hw_context_mode_switches`], [`Counters::hw_context_columns`]).
//!
//! # ROCR's own AIE suites
//!
//! `tests/rocr_suite_*.rs` mirror ROCR's four AIE gtest suites (`rocrtst/suites/aie/`:
//! `test_memory.cc`, `test_dispatch.cc`, `dispatch.cc`, `error_callback_test.cc`) one test per
//! suite test, under every profile the suite's era fits; the crate README has the counts and
//! what is left out.
//!
//! # Where the emulator differs from ROCR
//!
//! - A G1 packet whose ERT opcode is not START_CU fails instead of hanging the doorbell
//!   (except under `rocm-7.0`, which hangs as observed).
//! - Under `rocm-7.0` a NULL or unreadable payload aborts the process (`SIGABRT`) where ROCR
//!   faults (`SIGSEGV`); the PDI cache is keyed by PDI address where ROCR keys BO handles.
//! - The write index running more than 64 packets ahead of the read index fails the batch
//!   (ROCR would run overwritten slots).
//! - On ROCm 7.0 a command that outlives the 50 ms wait is abandoned but may still finish on
//!   the device and write its output later; the emulator's hung command never writes.
//! - ROCm 7.0 `assert`s its G1a header, AmdFormat and state checks (compiled out); the
//!   emulator lets them run and enforces the count and the transaction opcode (silently, as
//!   ROCm 7.0 reports everything; inferred).
//! - The newest driver (hsaco §4) answers a NULL kernarg buffer with arguments, more
//!   arguments than the kernarg buffer holds and an argument size past its allocation with
//!   `INVALID_PACKET_FORMAT`; the emulator gives `INVALID_ARGUMENT` and `INVALID_ALLOCATION`
//!   (under `rocr-g2-2026-07`, a NULL kernarg buffer gives the driver's `INVALID_PACKET_FORMAT`
//!   after the PDI and the instruction buffer resolve, in the driver's order).
//! - The first G2 release may not resolve vmem mappings as kernel arguments (§4.2,
//!   unconfirmed); under `rocr-g2-2026-05` the emulator accepts them, so IRON's vmem
//!   sequence runs.
//! - ROCR's default queue error handler can be quietened with
//!   `HSA_ENABLE_QUEUE_FAULT_MESSAGE=0`; the emulator always prints and aborts.
//! - vmem export returns a memfd rather than a dmabuf; it is sealed against shrink and grow,
//!   as a dmabuf cannot be resized.
//! - vmem mappings are host-accessible at once; what `set_access` records matters only for
//!   the AIE agent (any permission but NONE makes a mapping a valid kernel argument).
//! - Several live queues are allowed (ROCR reports `QUEUES_MAX` 1 but does not enforce it);
//!   the system-wide hardware-context limit is not emulated.
//! - Timestamps and signal timeouts tick in nanoseconds (`TIMESTAMP_FREQUENCY` = 1 GHz).
//! - `kernel-object`: a kernel object that is not a live descriptor is refused with
//!   `INVALID_PACKET_FORMAT` even when its first u32 happens to be 1 (a destroyed
//!   executable's, or foreign memory); real ROCR trusts it and runs on freed memory.
//! - `kernel-object`: a `FullElf` kernel runs only when its control code is emulated
//!   (`npu_artifacts::emu`: the emulated design's PDI at its PDI site, each buffer's address
//!   read back from its `ShimDma48` site); real control code gives `NOT_SUPPORTED`.
//! - `kernel-object`: when a section fails a loader rule ROCR checks after its duplicate-name
//!   check (kind, columns, PDI, full ELF), the emulator reads the names from the raw table for
//!   that check; a section that also breaks a later entry's section rule then reports the
//!   duplicate where ROCR would report `INVALID_CODE_OBJECT` (both fail).
//!
//! # Configuration
//! See [`config`]: `HSA_SIM_AGENT_NAME` (aie2 | aie2p, default aie2p), `HSA_SIM_PROFILE`
//! (rocm-7.0 | rocr-late-2025 | rocr-g2-2026-05 | rocr-g2-2026-07 | rocr-newest | kernel-object, default
//! rocr-newest),
//! `HSA_SIM_TIMEOUT_MS` (default 2000), read at the 0→1 `hsa_init`, or [`set_config`].
//!
//! # Extra C symbols
//! `hsa_sim_last_error(char* buf, size_t len) -> size_t` and
//! `hsa_sim_counters(Counters* out) -> hsa_status_t`.

mod agents;
pub mod config;
pub mod counters;
mod dispatch;
mod executable;
mod kernels;
mod memory;
pub mod profile;
mod queue;
mod regions;
mod rules;
mod runtime;
mod signal;
mod status;
pub mod timing;
mod vmem;

pub use agents::*;
pub use config::{
    PacketAbi, SerialGuard, SimConfig, agent_from_name, product_name, reset_config,
    serial_test_guard, set_config,
};
pub use counters::{Counters, counters, hsa_sim_counters};
pub use executable::{
    hsa_code_object_reader_create_from_memory, hsa_code_object_reader_destroy,
    hsa_executable_create_alt, hsa_executable_destroy, hsa_executable_freeze,
    hsa_executable_get_symbol_by_name, hsa_executable_load_agent_code_object,
    hsa_executable_symbol_get_info,
};
pub use memory::*;
pub use npu_artifacts::NpuGen;
pub use profile::{FailureReport, Profile, UnknownProfile, profile_of_build_version};
pub use queue::*;
pub use regions::*;
pub use runtime::{TIMESTAMP_FREQUENCY, hsa_init, hsa_shut_down, hsa_system_get_info};
pub use signal::*;
pub use status::{
    SimError, clear_last_error, hsa_sim_last_error, hsa_status_string, last_error,
    last_error_status,
};
pub use vmem::*;

/// The emulator's entry points as a function table: how the daemon links it statically.
/// Every field, required and optional, is filled.
pub fn fns() -> hsa_core::sys::HsaFns {
    hsa_core::sys::HsaFns {
        init: hsa_init,
        shut_down: hsa_shut_down,
        status_string: hsa_status_string,
        system_get_info: hsa_system_get_info,
        iterate_agents: hsa_iterate_agents,
        agent_get_info: hsa_agent_get_info,
        agent_iterate_memory_pools: hsa_amd_agent_iterate_memory_pools,
        memory_pool_get_info: hsa_amd_memory_pool_get_info,
        memory_pool_allocate: hsa_amd_memory_pool_allocate,
        memory_pool_free: hsa_amd_memory_pool_free,
        queue_create: hsa_queue_create,
        queue_destroy: hsa_queue_destroy,
        queue_load_read_index_scacquire: hsa_queue_load_read_index_scacquire,
        queue_load_write_index_relaxed: hsa_queue_load_write_index_relaxed,
        queue_add_write_index_relaxed: hsa_queue_add_write_index_relaxed,
        signal_create: hsa_signal_create,
        signal_destroy: hsa_signal_destroy,
        signal_load_scacquire: hsa_signal_load_scacquire,
        signal_store_relaxed: hsa_signal_store_relaxed,
        signal_store_screlease: hsa_signal_store_screlease,
        signal_wait_scacquire: hsa_signal_wait_scacquire,
        vmem_handle_create: Some(hsa_amd_vmem_handle_create),
        vmem_handle_release: Some(hsa_amd_vmem_handle_release),
        vmem_address_reserve_align: Some(hsa_amd_vmem_address_reserve_align),
        vmem_address_free: Some(hsa_amd_vmem_address_free),
        vmem_map: Some(hsa_amd_vmem_map),
        vmem_unmap: Some(hsa_amd_vmem_unmap),
        vmem_set_access: Some(hsa_amd_vmem_set_access),
        vmem_get_access: Some(hsa_amd_vmem_get_access),
        vmem_export_shareable_handle: Some(hsa_amd_vmem_export_shareable_handle),
        portable_export_dmabuf: Some(hsa_amd_portable_export_dmabuf),
        portable_close_dmabuf: Some(hsa_amd_portable_close_dmabuf),
        code_object_reader_create_from_memory: Some(hsa_code_object_reader_create_from_memory),
        code_object_reader_destroy: Some(hsa_code_object_reader_destroy),
        executable_create_alt: Some(hsa_executable_create_alt),
        executable_load_agent_code_object: Some(hsa_executable_load_agent_code_object),
        executable_freeze: Some(hsa_executable_freeze),
        executable_get_symbol_by_name: Some(hsa_executable_get_symbol_by_name),
        executable_symbol_get_info: Some(hsa_executable_symbol_get_info),
        executable_destroy: Some(hsa_executable_destroy),
    }
}

/// The emulator as an [`hsa_core::HsaApi`] named `name`: [`fns`] behind the device layer,
/// linked into this program.
pub fn api(name: &'static str) -> hsa_core::HsaApi {
    // SAFETY: every entry of `fns()` is this crate's own implementation of the C function of
    // that name, with the signature ROCR's headers give it, and it is linked into the program,
    // so it lives as long as the table. Each implementation checks its pointer arguments as
    // ROCR's contract lets it and writes no more than the headers say.
    unsafe { hsa_core::HsaApi::from_static(fns(), name) }
}
