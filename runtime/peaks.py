"""Dense peak FLOP/s per accelerator and dtype, from the vendors' spec sheets: the
denominator of MFU.

Dense means no 2:4 structured sparsity. Training runs dense matrix products, so a
sparse figure would halve every MFU. NVIDIA's sheets print the tensor-core rows
of L4, H100, H200 and B200 only "with sparsity" (the asterisk; "specifications are
one-half lower without sparsity"): those rows are halved here. The A100 and A10G
sheets print dense and sparse side by side ("312 | 624*"): the dense figure is
taken as printed. T4 (Turing) has no sparse mode. Plain FP32 (CUDA cores) is never
a sparse figure and is taken as printed. Each row's `source` says which figures
were halved or divided.

Dtype keys (DTYPES):
  fp32  plain FP32 on the CUDA cores, no tensor cores. PyTorch's default fp32 matmul
        precision ('highest') runs here, not on TF32: an fp32 step is measured
        against this row unless `torch.set_float32_matmul_precision('high')` (or
        'medium') lets it use TF32 (runtime.measure.flops.matmul_dtype decides which).
  tf32  TF32 tensor cores (Ampere and later).
  bf16  BF16 tensor cores (Ampere and later), FP32 accumulate.
  fp16  FP16 tensor cores with FP32 accumulate where the sheet distinguishes (T4's
        "mixed precision FP16/FP32"; PyTorch's fp16 matmuls accumulate in FP32).
A dtype a GPU has no unit for is absent from its row, not invented: a T4 has no
TF32 and no BF16 tensor cores, so its sheet has no such figure to measure against.

Form factors. SkyPilot's plain names mean the parts clouds sell in 8-GPU boards:
"A100"/"A100-80GB" the A100 SXM4 (AWS p4d/p4de, GCP a2), "H100" the H100 SXM5
(p5, a3), "H200" the H200 SXM (p5e/p5en, a3-ultra), "B200" the B200 SXM of an
HGX/DGX B200 board (p6-b200, a4). PCIe and NVL parts run at lower power limits,
and the H100/H200 sheets print lower figures for them (the A100 sheet prints the
same peaks for its PCIe card, which sustains less at 250-300 W): gpu_of_device_name
returns None for them, so a run whose device reports a PCIe part gets no MFU
rather than one against the wrong part. Where a cloud sells a PCIe part under a
plain SkyPilot name, trust the device's name.

A10G caveat. The A10G is AWS's variant (G5 instances) of the A10, and NVIDIA's A10
datasheet does not describe it: the A10G has 80 SMs to the A10's 72, yet its
sheet's tensor figures are 0.56x the A10's (70 against 125 TFLOP/s bf16). The
figures used are the dense ones of the "NVIDIA A10G Tensor Core GPU" datasheet
that AWS publishes (linked from the G5 page), as quoted in public copies; the
PDF itself was not read here. The A10's own figures (125 TFLOP/s bf16) would
understate an A10G's MFU by nearly half.

Provenance. The figures below are the sheets' own numbers as quoted by stored
public copies of the sheets (repositories and pages quoting them), cross-checked
against what NVIDIA's sheets are known to print; NVIDIA's and AWS's own files
could not be fetched from here.

Standard library only: imported by both the trainer runtime and the launcher.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16")

TERA = 1e12


@dataclass(frozen=True)
class Peak:
    gpu: str  # SkyPilot's accelerator name, e.g. "H100"
    part: str  # what the figures are for, e.g. "H100 SXM5 80GB"
    flops: dict[str, float]  # dtype -> dense FLOP/s per GPU (absent: no such unit)
    source: str  # document name + URL (+ which figures were halved / divided)


_T4 = Peak(
    gpu="T4",
    part="Tesla T4 16GB (PCIe, 70 W)",
    flops={"fp32": 8.1 * TERA, "fp16": 65.0 * TERA},
    source=(
        "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
        "Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf: 'Single-Precision 8.1 TFLOPS', "
        "'Mixed-Precision (FP16/FP32) 65 TFLOPS'. Taken as printed (Turing has no sparse mode); "
        "no TF32 or BF16 rows: Turing's tensor cores have neither."
    ),
)

_L4 = Peak(
    gpu="L4",
    part="L4 24GB (PCIe, 72 W)",
    flops={"fp32": 30.3 * TERA, "tf32": 60.0 * TERA, "bf16": 121.0 * TERA, "fp16": 121.0 * TERA},
    source=(
        "NVIDIA L4 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-l4/l4-datasheet "
        "(and https://www.nvidia.com/en-us/data-center/l4/): FP32 30.3 TFLOPS; TF32 Tensor Core "
        "120*, FP16 Tensor Core 242*, BFLOAT16 Tensor Core 242* TFLOPS, '* Shown with sparsity. "
        "Specifications are one-half lower without sparsity': the three tensor figures halved "
        "(60, 121, 121); FP32 as printed."
    ),
)

_A10G = Peak(
    gpu="A10G",
    part="A10G 24GB (AWS G5, PCIe; AWS's variant of the A10)",
    flops={"fp32": 35.0 * TERA, "tf32": 35.0 * TERA, "bf16": 70.0 * TERA, "fp16": 70.0 * TERA},
    source=(
        "NVIDIA A10G Tensor Core GPU datasheet as published by AWS, https://d1.awsstatic.com/"
        "product-marketing/ec2/NVIDIA_AWS_A10G_DataSheet_FINAL_02_17_2022.pdf (linked from "
        "https://aws.amazon.com/ec2/instance-types/g5/): FP32 35, TF32 35, BF16/FP16 70 TFLOPS "
        "dense (140 with sparsity); the dense figures as printed. The only vendor-published A10G "
        "sheet; figures from public copies quoting it, the PDF itself not read here. NVIDIA's A10 "
        "datasheet (31.2 / 62.5 / 125 / 125) is a different board and would overstate the A10G's "
        "tensor peak ~1.8x; published A10G bf16 GEMM measurements (~67-69 TFLOP/s) sit just "
        "under 70."
    ),
)

_A100 = Peak(
    gpu="A100",
    part="A100 SXM4 40GB / 80GB (same figures)",
    flops={"fp32": 19.5 * TERA, "tf32": 156.0 * TERA, "bf16": 312.0 * TERA, "fp16": 312.0 * TERA},
    source=(
        "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
        "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf: FP32 19.5 TFLOPS; "
        "TF32 156 | 312*, BFLOAT16 312 | 624*, FP16 312 | 624* TFLOPS (* with sparsity): the dense "
        "(left) figures as printed, nothing halved. The 40GB and 80GB SXM columns print the same "
        "compute figures."
    ),
)

_H100 = Peak(
    gpu="H100",
    part="H100 SXM5 80GB",
    flops={"fp32": 67.0 * TERA, "tf32": 494.5 * TERA, "bf16": 989.5 * TERA, "fp16": 989.5 * TERA},
    source=(
        "NVIDIA H100 Tensor Core GPU datasheet / https://www.nvidia.com/en-us/data-center/h100/, "
        "H100 SXM column: FP32 67 TFLOPS; TF32 989*, BFLOAT16 1,979*, FP16 1,979* TFLOPS, "
        "'* With sparsity': the three tensor figures halved (494.5, 989.5, 989.5); FP32 as printed."
    ),
)

_H200 = Peak(
    gpu="H200",
    part="H200 SXM 141GB",
    flops={"fp32": 67.0 * TERA, "tf32": 494.5 * TERA, "bf16": 989.5 * TERA, "fp16": 989.5 * TERA},
    source=(
        "NVIDIA H200 Tensor Core GPU datasheet / https://www.nvidia.com/en-us/data-center/h200/, "
        "H200 SXM column: FP32 67 TFLOPS; TF32 989, BFLOAT16 1,979, FP16 1,979 TFLOPS, printed with "
        "sparsity (footnote): the three tensor figures halved (494.5, 989.5, 989.5); FP32 as printed. "
        "Same GH100 compute as the H100 SXM; only the memory differs."
    ),
)

_B200 = Peak(
    gpu="B200",
    part="B200 SXM (HGX/DGX B200 board, up to 1,000 W per GPU)",
    flops={"fp32": 75.0 * TERA, "tf32": 1125.0 * TERA, "bf16": 2250.0 * TERA, "fp16": 2250.0 * TERA},
    source=(
        "NVIDIA HGX B200 datasheet / https://www.nvidia.com/en-us/data-center/hgx/ (8x B200 SXM, "
        "the board of the DGX B200): 8-GPU totals FP32 600 TFLOPS, TF32 Tensor Core 18 PFLOPS, "
        "FP16/BF16 Tensor Core 36 PFLOPS, the tensor rows with sparsity (footnote): divided by 8 "
        "GPUs, tensor rows then halved (75 TF, 1.125 PF, 2.25 PF, 2.25 PF). Its per-GPU rows "
        "(FP32 75 TF, TF32 2.2 PF, FP16/BF16 4.5 PF, sparse) agree. The DGX B200 datasheet "
        "(https://www.nvidia.com/en-us/data-center/dgx-b200/) prints only FP8 (72 PFLOPS) and FP4 "
        "(144 PFLOPS) for its 8 GPUs; FP8 72/8/2 = 4.5 PF dense, twice the BF16 figure, as expected."
    ),
)

PEAKS: dict[str, Peak] = {
    "T4": _T4,
    "L4": _L4,
    "A10G": _A10G,
    "A100": _A100,
    "A100-80GB": _A100,
    "A100-80GB-SXM": _A100,
    "H100": _H100,
    "H100-80GB": _H100,
    "H100-SXM": _H100,
    "H100-MEGA": _H100,
    "H100-MEGA-80GB": _H100,
    "H200": _H200,
    "B200": _B200,
}
"""Keyed by the upper-case SkyPilot name. Aliases name the same part: "A100-80GB" is the
80GB SXM4 (same compute as the 40GB), "H100-MEGA" is GCP's a3-megagpu (H100 SXM5 with
more NICs)."""

_LISTED = ", ".join(dict.fromkeys(p.gpu for p in PEAKS.values()))


def _article(name: str) -> str:
    """'a' or 'an' before a GPU name read letter by letter: 'an H100', 'a T4'."""
    return "an" if name[:1].upper() in "AEFHILMNORSX" else "a"


def _key(gpu: str) -> str:
    """'h100:8' / ' H100 ' -> 'H100': SkyPilot's accelerator spec, count dropped."""
    return gpu.strip().split(":", 1)[0].strip().upper()


def peak_flops(gpu: str | None, dtype: str) -> tuple[float | None, str]:
    """(dense FLOP/s per GPU, why) -- None with the reason when unknown: no GPU (CPU), an
    unlisted GPU type, or a dtype this GPU has no unit for (e.g. bf16 on a T4).

    `gpu` is SkyPilot's accelerator name ("H100", "A100-80GB", "T4:2"); a device name as
    torch or nvidia-smi prints it ("NVIDIA H100 80GB HBM3") is accepted too."""
    if gpu is None or not gpu.strip() or _key(gpu) == "CPU":
        return None, "no peak is known for a CPU"
    if dtype not in DTYPES:
        return None, f"no peak is known for dtype '{dtype}' (known: {', '.join(DTYPES)})"
    peak = PEAKS.get(_key(gpu))
    if peak is None:
        by_device = gpu_of_device_name(gpu)
        peak = PEAKS.get(by_device) if by_device else None
    if peak is None:
        return None, f"no peak is known for GPU type '{gpu.strip()}' (listed: {_LISTED})"
    flops = peak.flops.get(dtype)
    if flops is None:
        return None, f"{_article(peak.gpu)} {peak.gpu} has no {dtype} tensor cores"
    unit = "CUDA cores" if dtype == "fp32" else "tensor cores"
    return flops, (
        f"{flops / TERA:g} TFLOP/s dense {dtype} ({unit}) of {_article(peak.part)} {peak.part}, per the vendor's sheet"
    )


_DEVICE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), key)
    for pattern, key in (
        (r"T4", "T4"),
        (r"L4", "L4"),
        (r"A10G", "A10G"),
        (r"A100-SXM\d?(-\d+GB)?", "A100"),  # 'A100-SXM4-40GB', 'A100-SXM4-80GB', 'A100-SXM-80GB'
        (r"H100( \d+GB)? HBM3|H100 SXM\d?( \d+GB)?|H100", "H100"),  # PCIe: 'H100 PCIe'; NVL: 'H100 NVL'
        (r"H200( \d+GB)?( HBM3E)?|H200 SXM( \d+GB)?", "H200"),  # NVL: 'H200 NVL'
        (r"B200", "B200"),
    )
)


def gpu_of_device_name(name: str) -> str | None:
    """torch.cuda.get_device_name() / nvidia-smi's name -> the table's key:
    'Tesla T4' -> 'T4', 'NVIDIA A100-SXM4-80GB' -> 'A100', 'NVIDIA H100 80GB HBM3' -> 'H100',
    'NVIDIA H200' -> 'H200', 'NVIDIA L4' -> 'L4', 'NVIDIA A10G' -> 'A10G', 'NVIDIA B200' -> 'B200';
    None for anything else: 'NVIDIA A10' is not an A10G, and 'H100 PCIe' is a different part
    with its own, lower, sheet figures (the table has no PCIe rows).

    So None too for the PCIe/NVL forms of the listed parts ('NVIDIA A100-PCIE-40GB',
    'NVIDIA A100 80GB PCIe', 'NVIDIA H100 PCIe', 'NVIDIA H100 NVL', 'NVIDIA H200 NVL'),
    for their relatives ('NVIDIA L40S', 'NVIDIA H20', 'NVIDIA GH200 480GB', 'NVIDIA GB200')
    and for a MIG slice ('NVIDIA A100-SXM4-40GB MIG 1g.5gb'), which has only part of the
    GPU's units."""
    text = " ".join(name.split()).upper()
    for prefix in ("NVIDIA ", "TESLA "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    for pattern, key in _DEVICE_PATTERNS:
        if pattern.fullmatch(text):
            return key
    return None
