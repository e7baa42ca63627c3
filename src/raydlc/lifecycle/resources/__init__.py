"""One module per resource `up` makes and `down` removes, each one `raydlc.lifecycle.resource.Resource`.

Which resources a run covers, and in what order, is said once, in `raydlc.lifecycle.orders`.
"""
