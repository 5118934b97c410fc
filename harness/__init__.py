"""What runs the strategies, one package per job; imports go one way, through each job's
public names (its __init__):

    common   what all share: GPU data sheets, byte units, colours, test hooks
    train    one run: the loop, optimizer, metrics, checkpoints, launching
    plan     predictions for sizes not yet run (stands alone)
    compare  the sweep: uses train to run and plan to predict, judges the curves
    report   the document, from the results the compare wrote
"""
