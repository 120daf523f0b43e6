"""Several coordinator processes as one Kafka cluster: each process with a Kafka listener is a
broker registered in the store under a lease it renews; partition leadership and the
coordinators of groups and transactional ids are spread over the live brokers (`placement`,
pure rules), written and read by `brokers`, and held in memory by each process (`view`)."""
