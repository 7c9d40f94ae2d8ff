"""The renderers of the generated blocks, one module per page.

`common` (reading results files), `timings` (the README's opening lines and the benchmarks table),
`depth_study` (the MNIST depth study), `gates` (what the gates learned), `identity` (SDI/TSDI),
`hessian` (Demystifying ResNet), `batched` (batched training and the highway search), `conv`
(convolutional networks), `cli_reference` (the command-line page); `tools.readme` maps every block
name to its renderer (`RENDERERS`) and rewrites the pages.
"""
