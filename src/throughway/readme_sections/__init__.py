"""The renderers of the README's generated blocks, one module per README section.

`common` (reading results files), `timings` (the opening lines' costs and the Benchmarks table),
`depth_study` (section 1), `identity` (section 3), `hessian` (section 4), `batched` (section 5),
`conv` (section 6); section 2's gate renderers are in `throughway.readme`, which maps every block
name to its renderer (`RENDERERS`) and rewrites the README.
"""
