//! CUDA codegen without a GPU: golden rendered sources for canonical graphs (a codegen
//! change shows up in review as a diff of `tests/golden/*.cu`; regenerate with
//! `KILN_BLESS=1`), and NVRTC compiles of them, plus a deliberately broken kernel whose
//! error must carry the NVRTC log.
//!
//! NVRTC runs without a GPU. When its library is not on the loader path the NVRTC tests
//! print why and pass, unless `KILN_REQUIRE_NVRTC=1` (set by `.ci/run`) makes that a failure.

use kiln::backend::cuda::render::{Launch, render_all};
use kiln::kernel::Step;
use kiln::{DType, RealizeOptions, Tensor};
use std::path::PathBuf;

fn input(shape: &[usize], dtype: DType) -> Tensor {
    let t = Tensor::try_randn(shape, 1, DType::F32).unwrap().cast(dtype);
    t.realize().unwrap();
    t
}

/// Canonical graphs, each planned fused into one kernel.
fn canonical() -> Vec<(&'static str, Tensor)> {
    let x = input(&[32, 100], DType::F32);
    let h = input(&[32, 100], DType::F16);
    let b = input(&[64, 48], DType::BF16);
    let i = input(&[16, 16], DType::I32);
    let long = input(&[1 << 18], DType::F32);
    let long_h = input(&[1 << 18], DType::F16);
    let tall = input(&[1 << 14, 40], DType::F32);
    vec![
        (
            "elementwise_chain_f32",
            ((&x * 2.0 + 1.0).exp() - &x).sqrt(),
        ),
        ("softmax_rows_f32", x.softmax(-1)),
        ("layer_norm_f32", x.layer_norm(&[100], None, None, 1e-5)),
        ("half_mix_f16", (&h * 0.5).tanh() + h.sigmoid()),
        ("bf16_column_sum", b.sum(0)),
        ("argmax_columns_f32", x.argmax(0)),
        (
            "views_pad_flip_slice",
            x.flip([1])
                .slice(&[(0, 32, 3)])
                .pad(&[(1, 1), (2, 0)], -1.0)
                * 3.0,
        ),
        (
            "int_wrapping_i32",
            (&i * 3 - 7).maximum(i.t()).cast(DType::U8),
        ),
        (
            "rand_normal_f32",
            Tensor::rand_seeded([8, 8], 3) + Tensor::randn_seeded([8, 8], 4),
        ),
        ("matmul_epilogue_f32", (x.matmul(&x.t()) + 1.0).relu()),
        ("cumsum_rows_f32", x.t().cumsum(1)),
        ("cumprod_i32", i.cumprod(0)),
        ("argsort_rows_f16_descending", h.argsort(-1, true)),
        ("argsort_i32", i.argsort(0, false)),
        ("sum_all_split_f32", long.sum(..)),
        ("argmax_all_split_f16", long_h.argmax(..)),
        ("column_mean_split_lanes_f32", tall.mean(0)),
        (
            "scatter_amax_self_f32",
            x.t().scatter_reduce(0, &scatter_index(), &x, "amax", true),
        ),
    ]
}

/// Places along dimension 0 of a `[.., 32]` tensor for an `[8, 32]` index (repeats
/// included).
fn scatter_index() -> Tensor {
    Tensor::from_vec((0..256).map(|k| (k * 7 % 13) as i64).collect(), [8, 32])
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

fn rendered(t: &Tensor) -> Vec<kiln::backend::cuda::render::RenderedKernel> {
    let plan = t.plan(&RealizeOptions::default()).unwrap();
    plan.steps()
        .iter()
        .filter_map(|s| match s {
            Step::Kernel(k) => Some(render_all(k.kernel()).unwrap()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn rendered_sources_match_golden_files() {
    let bless = std::env::var_os("KILN_BLESS").is_some();
    let mut mismatches = vec![];
    for (name, t) in canonical() {
        let ks = rendered(&t);
        let text: String = ks
            .iter()
            .map(|k| format!("// launch: {:?}\n{}", k.launch, k.source))
            .collect();
        let path = golden_dir().join(format!("{name}.cu"));
        if bless {
            std::fs::create_dir_all(golden_dir()).unwrap();
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("missing golden file {path:?}; run with KILN_BLESS=1"));
        if want != text {
            mismatches.push(name);
        }
    }
    assert!(
        mismatches.is_empty(),
        "rendered CUDA changed for {mismatches:?}; review and rerun with KILN_BLESS=1"
    );
}

#[test]
fn rendering_follows_the_kernel_structure() {
    for (name, t) in canonical() {
        for k in rendered(&t) {
            assert!(
                k.source
                    .contains(&"extern \"C\" __global__ void __launch_bounds__".to_string()),
                "{name}"
            );
            assert!(k.source.contains(&k.name), "{name}");
        }
    }
    let x = input(&[32, 100], DType::F32);
    let ks = rendered(&x.softmax(-1));
    assert_eq!(ks.len(), 1);
    assert_eq!(
        ks[0].launch,
        Launch::Rows {
            groups: 32,
            block: 128,
            splits: 1
        }
    );
    assert_eq!(
        ks[0].source.matches("kiln_block_reduce<").count(),
        2,
        "max and sum"
    );
    assert!(!ks[0].split_scratch);
    // Softmax reads its row in three passes: a row of up to 16 elements per thread is kept
    // in registers after the first (4096 over 256 threads: 16 slots, no guard needed).
    let wide = input(&[4, 4096], DType::F32);
    let src = &rendered(&wide.softmax(-1))[0].source;
    assert!(src.contains("float rc0_[16];"), "{src}");
    assert_eq!(src.matches("a0[").count(), 1, "one load from memory: {src}");
    assert_eq!(src.matches("rc0_[q_]").count(), 3, "{src}");
    assert!(!src.contains("if (a_ < 4096)"));
    // A longer row streams from memory in every pass.
    let longer = input(&[2, 4097], DType::F32);
    let src = &rendered(&longer.softmax(-1))[0].source;
    assert!(
        !src.contains("rc0_") && src.matches("a0[").count() == 3,
        "{src}"
    );
    // A column sum: blocks of 32 adjacent columns, 8 threads each, so a warp reads 32
    // consecutive elements of a row.
    let ks = rendered(&x.sum(0));
    assert_eq!(
        ks[0].launch,
        Launch::Rows {
            groups: 4,
            block: 256,
            splits: 1
        }
    );
    assert!(ks[0].source.contains("kiln_lane_reduce<0, 32, float>"));
    assert!(ks[0].source.contains("if (t_ == 0 && live_)"));
    // A row sum keeps one block per row.
    assert!(matches!(
        rendered(&x.sum(1))[0].launch,
        Launch::Rows {
            groups: 32,
            splits: 1,
            ..
        }
    ));
    // A full reduction of 1M elements is split over 256 blocks, combined by the last one.
    let big = input(&[1 << 20], DType::F32);
    for t in [big.sum(..), big.argmax(..)] {
        let ks = rendered(&t);
        assert_eq!(
            ks[0].launch,
            Launch::Rows {
                groups: 1,
                block: 256,
                splits: 256
            }
        );
        assert!(ks[0].split_scratch);
        assert!(ks[0].source.contains("atomicAdd(&kcount_[g_], 1u) == 255u"));
    }
    // Columns of a tall matrix: split and laned at once.
    let tall = input(&[1 << 16, 64], DType::F32);
    let ks = rendered(&tall.max(0));
    assert_eq!(
        ks[0].launch,
        Launch::Rows {
            groups: 2,
            block: 256,
            splits: 512
        }
    );
    let ks = rendered(&(&x + 1.0));
    assert!(matches!(ks[0].launch, Launch::Elementwise { numel: 3200 }));
    // Half types pull in the conversion helpers; only random kernels pull in the generator.
    let h = input(&[4], DType::F16);
    assert!(
        rendered(&(h.flip([0]) * 2.0))[0]
            .source
            .contains("kiln_f16_to_f32(a0[")
    );
    // Contiguous 2- and 4-byte operands load and store four elements as one vector; a view
    // with an offset or a mask, or an 8-byte type, keeps scalar accesses.
    let src = &rendered(&(&h * 2.0))[0].source;
    assert!(src.contains("const ushort4 w0_ = reinterpret_cast<const ushort4*>(a0)[j_];"));
    assert!(src.contains("kiln_f16_to_f32(w0_.w)"));
    let src = &rendered(&(&x * 2.0 + 1.0))[0].source;
    assert!(src.contains("reinterpret_cast<float4*>(a1)[j_] = make_float4("));
    assert!(
        !src.contains("for (long long i0_"),
        "3200 elements leave no tail"
    );
    let odd = input(&[7, 3], DType::F32);
    let src = &rendered(&(&odd * 2.0))[0].source;
    assert!(
        src.contains("nv_ = 5LL") && src.contains("i0_ = 4 * nv_"),
        "{src}"
    );
    for t in [
        x.slice(&[(1, 32, 1)]) * 2.0,
        x.pad(&[(0, 0), (1, 0)], 0.0) * 2.0,
        x.cast(DType::F64) * 2.0,
    ] {
        assert!(!rendered(&t)[0].source.contains("j_ < nv_"));
    }
    assert!(
        !rendered(&(&x + 1.0))[0]
            .source
            .contains("kiln_rand_bits(unsigned")
    );
}

#[cfg(feature = "cuda")]
mod nvrtc {
    use super::*;
    use kiln::backend::cuda::nvrtc::{availability, compile};

    fn nvrtc_or_skip() -> bool {
        match availability() {
            Ok(_) => true,
            Err(why) => {
                assert!(
                    std::env::var_os("KILN_REQUIRE_NVRTC").is_none(),
                    "KILN_REQUIRE_NVRTC is set but NVRTC is unusable: {why}"
                );
                eprintln!("skipping NVRTC test: {why}");
                false
            }
        }
    }

    #[test]
    fn canonical_kernels_compile_for_sm90_and_sm80() {
        if !nvrtc_or_skip() {
            return;
        }
        for (name, t) in canonical() {
            for k in rendered(&t) {
                for arch in ["sm_90", "sm_80"] {
                    let cubin = compile(&k.source, &k.name, arch)
                        .unwrap_or_else(|e| panic!("{name} for {arch}: {e}"));
                    assert!(cubin.starts_with(b"\x7fELF"), "CUBIN is an ELF image");
                }
            }
        }
    }

    /// Every scatter reduction, with and without its initial value, in every dtype CUDA
    /// scatters (the compare-and-swap loops, the integer atomics, the identities).
    #[test]
    fn scatter_kernels_compile_for_every_reduction_and_dtype() {
        if !nvrtc_or_skip() {
            return;
        }
        let idx = scatter_index();
        for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
            let x = input(&[16, 32], dt);
            let v = input(&[8, 32], dt);
            for reduce in ["sum", "prod", "mean", "amax", "amin"] {
                for include_self in [true, false] {
                    let y = x.scatter_reduce(0, &idx, &v, reduce, include_self);
                    for k in rendered(&y) {
                        for arch in ["sm_90", "sm_80"] {
                            let cubin = compile(&k.source, &k.name, arch).unwrap_or_else(|e| {
                                panic!("{reduce} {include_self} {dt:?} for {arch}: {e}")
                            });
                            assert!(cubin.starts_with(b"\x7fELF"));
                        }
                    }
                }
            }
            for k in rendered(&x.scatter(0, &idx, &v)) {
                compile(&k.source, &k.name, "sm_90")
                    .unwrap_or_else(|e| panic!("scatter {dt:?}: {e}"));
            }
        }
    }

    #[test]
    fn compiled_kernels_are_cached_in_memory_and_on_disk() {
        use kiln::backend::cuda::nvrtc::{CacheHit, cache_dir, compile_cached};
        if !nvrtc_or_skip() {
            return;
        }
        let Some(dir) = cache_dir() else {
            eprintln!("no cache directory (HOME unset); skipping");
            return;
        };
        // A source unique to this run, so the first compile cannot be a disk hit.
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let src = format!(
            "// cache test {stamp}\nextern \"C\" __global__ void cached(float* a) {{ a[threadIdx.x] *= 2.0f; }}"
        );
        let (a, how) = compile_cached(&src, "cached", "sm_90").unwrap();
        assert_eq!(how, CacheHit::Compiled);
        let (b, how) = compile_cached(&src, "cached", "sm_90").unwrap();
        assert_eq!(how, CacheHit::Memory);
        assert_eq!(a, b);
        let on_disk = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| std::fs::read(e.path()).is_ok_and(|bytes| bytes == *a));
        assert!(
            on_disk,
            "the CUBIN is written under {dir:?} for the next process"
        );
    }

    /// A new plan's kernels are compiled together, in parallel, before the first launch
    /// (what a realize on a GPU does first); kernels already rendered are left alone.
    #[test]
    fn precompile_compiles_a_new_plans_kernels_once() {
        use kiln::backend::cuda::nvrtc::{CacheHit, compile_cached};
        use kiln::backend::cuda::{precompile, render::render};
        use kiln::kernel::PlannedKernel;
        if !nvrtc_or_skip() {
            return;
        }
        let x = input(&[64, 96], DType::F32).to(kiln::Device::Cuda(0));
        let y = ((&x * 1.5 + 0.25).tanh() * &x).softmax(-1);
        let plan = y.plan(&RealizeOptions::unfused()).unwrap();
        let kernels: Vec<&PlannedKernel> = plan
            .steps()
            .iter()
            .filter_map(|s| match s {
                Step::Kernel(k) => Some(k.as_ref()),
                _ => None,
            })
            .collect();
        assert!(kernels.len() >= 5, "{} kernels", kernels.len());
        assert_eq!(precompile(&kernels, "sm_90"), kernels.len());
        assert_eq!(
            precompile(&kernels, "sm_90"),
            0,
            "already rendered and compiled"
        );
        for k in &kernels {
            let r = render(k.kernel()).unwrap();
            let (_, hit) = compile_cached(&r.source, &r.name, "sm_90").unwrap();
            assert_eq!(hit, CacheHit::Memory, "{}", r.name);
        }
    }

    #[test]
    fn broken_kernel_returns_the_nvrtc_log() {
        if !nvrtc_or_skip() {
            return;
        }
        let src = "extern \"C\" __global__ void broken(float* a) { a[0] = undefined_name + 1; }";
        match compile(src, "broken", "sm_90") {
            Err(kiln::KilnError::Compile {
                kernel,
                arch,
                log,
                source_code,
            }) => {
                assert_eq!(kernel, "broken");
                assert_eq!(arch, "sm_90");
                assert!(log.contains("undefined_name"), "log: {log}");
                assert_eq!(source_code, src);
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }
}
