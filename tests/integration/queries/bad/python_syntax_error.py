def query(events)
    return events
