"""Producer ids: the table that issues them and holds each one's current epoch, below the log
(whose producer state names them). InitPid itself is the transactions domain's
(`coordinator.transactions.producer_ids`)."""
