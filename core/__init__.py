"""What every layer shares: the input error, capped reads and atomic writes, the shipped data's paths,
the name lists the command line offers, and the cost profile (the contract between engine and simulator).

The bottom layer: it imports numpy and the standard library only, never torch, gymnasium or another
package of this project, so ``specblock --help`` and the engine stay light.
"""
