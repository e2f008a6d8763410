module libmegatrain/go/megatrain

go 1.19
