module rtserve/deploy/cluster/pause

go 1.26.0
